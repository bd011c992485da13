from oomdoctor.cli import entry

entry()
