"""Scripts that accel runs under `accel launch` (the smoke check of `accel test`)."""
