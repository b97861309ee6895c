"""Tests against real servers, real clients, the wheel, the container, Kubernetes manifests and the bench."""
