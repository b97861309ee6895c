"""Gateway policy, applied once for every dialect: auth, extra parameters, capabilities, limits."""
