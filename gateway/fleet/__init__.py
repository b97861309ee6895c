"""Where a request goes: the router picks a deployment's replica, the dispatcher tries it, the wait
queue holds what cannot start yet."""
