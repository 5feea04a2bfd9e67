"""The preflight admission webhook (issue 46): its decision (mutate) and its HTTPS server."""
