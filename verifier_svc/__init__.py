"""The verifier service: owns the target, verifies draft trees, source of truth for every
generation; talks to the drafter service over one long-lived bidirectional stream."""
