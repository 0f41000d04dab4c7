module livecov.dev/hooks/go

go 1.21
