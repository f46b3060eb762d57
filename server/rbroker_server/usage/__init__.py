"""Usage history: GPU MiB-hours granted and used per day, project and user, rolled up from
the reports and read group-scoped (`GET /api/v1/usage`, the web view's usage page)."""
