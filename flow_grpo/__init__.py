"""flow_grpo: GRPO for flow-matching generators (SD3, FLUX)."""
