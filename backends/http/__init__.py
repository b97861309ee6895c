"""The parts of a backend that speaks HTTP to an upstream: the pooled client, its options, status
mapping, stream decoders, fan-out."""
