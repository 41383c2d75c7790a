"""The interference guard: what it reads (NVML, the host meter, the host reference, the pod-resources API), the facts
it gathers over each point (``guard``) and the rule that decides from them (``rule``; docs/guard.md)."""
