"""Developer tools: the demo, an embedded Redis for it, process helpers for tests and benches,
and example lanes. Nothing in the library imports them."""
