"""Tests that start a chatgate gateway (and stand-in upstreams) as processes on loopback."""
