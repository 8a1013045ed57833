"""The router: the tenants' gRPC front door. Authenticates, checks the tenant's catalog, places each request
on a host daemon (cache-aware), forwards the request bytes unchanged and retries on another host if one fails."""
