"""The drafter service: runs the DFlash drafter and streams draft trees to verifiers."""
