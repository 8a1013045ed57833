"""A model version's lifecycle states now live in the host core (hostd/core/lifecycle.py, with the
Lifecycle state machine); this name stays for existing imports."""

from hostd.core.lifecycle import LEGAL, IllegalTransition, ModelState, check_transition, failed_backoff

__all__ = ["LEGAL", "IllegalTransition", "ModelState", "check_transition", "failed_backoff"]
