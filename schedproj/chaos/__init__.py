"""Fault injection with real processes: the promises of DESIGN.md section 3 under fire."""
