"""The terminal app (`oomdoctor open`, `oomdoctor demo`): the one part of oomdoctor that imports Textual.

    from oomdoctor.tui.app import make_app
    make_app(analysis, snapshot, source="dump.pickle").run()

`oomdoctor.tui.content` builds what each tab shows as plain data (it imports no Textual); the
widgets in the other modules only lay it out.
"""
