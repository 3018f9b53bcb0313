// Package chiroute names chi routes for the idempotency middleware's events
// and logs when the middleware is mounted with chi's r.Use, where chi
// routes a request only after the middleware saw it:
//
//	r := chi.NewRouter()
//	r.Use(idempotency.New(store, idempotency.WithRoute(chiroute.Pattern)))
//
// With r.With, or a middleware inside a route, chi has routed the request
// already and the middleware's default finds the pattern without it.
package chiroute

import (
	"net/http"

	"github.com/go-chi/chi/v5"
)

// Pattern returns the pattern of the chi route of r ("/payments/{id}"): the
// one chi matched, when it has routed r, else the one its router would
// match, and "" for a request no route matches or outside a chi router.
func Pattern(r *http.Request) string {
	if r.Pattern != "" {
		return r.Pattern
	}
	rctx := chi.RouteContext(r.Context())
	if rctx == nil {
		return ""
	}
	if p := rctx.RoutePattern(); p != "" {
		return p
	}
	if rctx.Routes == nil {
		return ""
	}
	path := r.URL.RawPath
	if path == "" {
		path = r.URL.Path
	}
	return rctx.Routes.Find(chi.NewRouteContext(), r.Method, path)
}
