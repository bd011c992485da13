"""Rehearsal: run a training script on CPU against a simulated CUDA caching allocator.

This package's own modules import no torch; the simulator lives in `allocator`.
"""

from oomdoctor.rehearse.allocator import CachingAllocatorSimulator, SimulatedOutOfMemory
from oomdoctor.rehearse.allocator_config import AllocatorConfigError

__all__ = ["CachingAllocatorSimulator", "SimulatedOutOfMemory", "AllocatorConfigError", "current_session"]


def current_session():
    """The running rehearsal session (`oomdoctor.rehearse.session.RehearsalSession`), or None."""
    from oomdoctor.rehearse.session import current_session as _current_session

    return _current_session()
