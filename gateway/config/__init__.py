"""The configuration: read from YAML and the environment once, validated into typed settings, watched
for reloads."""
