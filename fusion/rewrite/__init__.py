"""fusion.rewrite: graph rewriting before planning (DNNFusion §4.2 and exact cleanups).

    log = rewrite(model, fast_math=False)   # in place; log.counts says which rules fired
"""

from .base import RULES, Rule
from .engine import RewriteLog, active_rules, rewrite

__all__ = ["RULES", "Rule", "RewriteLog", "active_rules", "rewrite"]
