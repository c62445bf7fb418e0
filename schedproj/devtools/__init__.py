"""Developer tools: the demo, an embedded Redis for it, the one redis-server launcher (the demo,
the Sentinel set and the chaos run start theirs there), process and polling helpers for tests
and benches, and example lanes. Nothing in the library imports them."""
