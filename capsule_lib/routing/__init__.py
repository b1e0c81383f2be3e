"""Routing algorithms, one module each, with the same calling convention and the same trace object."""
from .dynamic import DynamicRouting, capsule_votes, dynamic_routing
from .trace import RoutingTrace

__all__ = ["RoutingTrace", "dynamic_routing", "DynamicRouting", "capsule_votes"]
