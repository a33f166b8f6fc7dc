"""What the engine and the backends share: the host side of tool calls (pool, workers, the
boundary's helpers), the LLM gate, timeouts, loops, telemetry, memory's store. It imports the
contract only (and the engine's types for annotations)."""
