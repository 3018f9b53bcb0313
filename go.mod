module github.com/go-idempotency/idempotency

go 1.24

require (
	github.com/go-chi/chi/v5 v5.5.0
	github.com/google/uuid v1.6.0
)
