"""Training a DFlash drafter by self-distillation: prompts from software the host already
has (`prompts`), the target's own answers (`responses`), random-anchor block batches
(`data`), the training loop (`trainer`) and the staged recipe tying them (`recipe`)."""
