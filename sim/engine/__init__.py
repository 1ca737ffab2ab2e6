"""The serving system in SimPy: deployment, replicas and cluster, routers, KV links, step records."""
