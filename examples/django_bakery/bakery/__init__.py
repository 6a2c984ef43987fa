"""The bakery: orders, and the job that bakes each one."""
