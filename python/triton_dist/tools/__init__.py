"""Developer tools: ahead-of-time compile checks, (later) the benchmark harness and profilers."""
