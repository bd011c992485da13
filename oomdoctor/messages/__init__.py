"""OOM messages without a dump: find them in a log, read their figures, explain what they mean.

    from oomdoctor.messages import find_messages, explain
    messages = find_messages(log_text)        # [OomMessage, ...], in order, each distinct one once
    explanation = explain(messages[0])        # verdict, what each figure means, derived bytes, unknowns

Pure Python: no torch, no I/O.
"""

from __future__ import annotations

from oomdoctor.messages.explain import Explanation, explain
from oomdoctor.messages.model import OomMessage, ProcessUsage
from oomdoctor.messages.parse import ForeignMessage, find_messages

__all__ = ["Explanation", "ForeignMessage", "OomMessage", "ProcessUsage", "explain", "find_messages"]
