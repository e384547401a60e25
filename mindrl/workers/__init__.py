"""Ray plumbing: joining a cluster, placing worker groups, calling them with deadlines."""
