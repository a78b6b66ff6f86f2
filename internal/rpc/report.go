package rpc

import (
	"context"
	"net/http"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
)

// Report returns a job's overhead model, interval and restart odds.
func (c *CoordClient) Report(ctx context.Context, name string) (coordv1.Report, error) {
	var out coordv1.Report
	return out, c.rpc.Do(ctx, http.MethodGet, jobPath(name, coordv1.SuffixReport), nil, &out)
}
