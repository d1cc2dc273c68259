module rekindle-e2e/pause

go 1.22
