"""The shop app: orders, and the job that ships each one."""
