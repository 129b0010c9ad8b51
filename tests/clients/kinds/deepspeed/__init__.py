"""A stand-in for DeepSpeed's ZeRO (tests/kinds.rs): its files where DeepSpeed has them, so the
frames of each request are those of the real package, and the order of its requests as it
makes them. No communication happens."""
