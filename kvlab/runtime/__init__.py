"""The runtime layer: starts and reads the vLLM engine and the services beside it (server, Redis, gateway, kernels).
It knows nothing of lessons; the topic modules and the course build on it."""
