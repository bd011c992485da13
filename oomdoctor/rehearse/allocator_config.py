"""Kept for `oomdoctor.commands.rehearse`, which imports the parser from here.

The allocator's settings and rules live in `oomdoctor.allocator_rules`; import them from there.
"""

from __future__ import annotations

from oomdoctor.allocator_rules import AllocatorConfig, AllocatorConfigError, parse_alloc_conf

__all__ = ["AllocatorConfig", "AllocatorConfigError", "parse_alloc_conf"]
