"""The tools over a store: the mqstore command and its commands, the invariant checker, the
inspection and recovery dry run, live statistics and the soak test."""
