"""Several processes: each rank's share, reductions, micro-batches every rank joins, FSDP2."""
