"""Quorum runner: the HTTP service in front of one inference engine."""

__version__ = "0.1.0"
