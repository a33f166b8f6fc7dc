"""The contract: the protocols a backend implements, the records the kernel keeps and hands
out, its errors and its limits. It imports nothing from the engine or the face above it."""
