"""What watches a VLM run, as library modules the recipe calls with explicit arguments: the validation curve
(:mod:`.validation`), the format-collapse guard (:mod:`.format_guard`), the step-0 on-policy check (:mod:`.onpolicy`)
and the step's metric reduction / completion log (:mod:`.metrics`)."""
