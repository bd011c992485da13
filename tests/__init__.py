"""oomdoctor's tests: a package, so that test modules share `tests.builders` and `tests.conftest`.

Run from the repository root: `python -m pytest -q` (everything) or `python -m pytest -q -m "not slow"`.
"""
