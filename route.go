package idempotency

import "net/http"

// route names the route of the request for events and logs: the function
// set with WithRoute, or the pattern of the route that served it, however
// the middleware is mounted. After the handler ran, that is the pattern a
// router beneath the middleware set on the handler's request (http.ServeMux
// and chi set Request.Pattern); before, or when no router beneath set one,
// the pattern a router above set, or, when the middleware wraps an
// http.ServeMux directly, the pattern the mux would choose.
func (rq *request) route() string {
	r := rq.r
	if rq.served != nil {
		r = rq.served
	}
	if rq.h.cfg.route != nil {
		return rq.h.cfg.route(r)
	}
	if r.Pattern != "" {
		return r.Pattern
	}
	if rq.r.Pattern != "" {
		return rq.r.Pattern
	}
	if mux, ok := rq.h.next.(*http.ServeMux); ok {
		_, pattern := mux.Handler(rq.r)
		return pattern
	}
	return ""
}
