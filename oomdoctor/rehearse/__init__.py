"""Rehearsal: run a training script on CPU against a simulated CUDA caching allocator.

Importing this package imports no torch. The simulator (`allocator`, `allocator_fidelity`) is pure
Python and takes the allocator's rules and settings from `oomdoctor.allocator_rules`; only the
recorder and the session import torch.
"""

from oomdoctor.allocator_rules import AllocatorConfigError
from oomdoctor.rehearse.allocator import CachingAllocatorSimulator, SimulatedOutOfMemory

__all__ = ["CachingAllocatorSimulator", "SimulatedOutOfMemory", "AllocatorConfigError", "current_session"]


def current_session():
    """The running rehearsal session (`oomdoctor.rehearse.session.RehearsalSession`), or None."""
    from oomdoctor.rehearse.session import current_session as _current_session

    return _current_session()
