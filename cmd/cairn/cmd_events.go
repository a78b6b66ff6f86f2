package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/rpc"
	"github.com/cairn-hpc/cairn/internal/table"
)

func newEventsCmd() *cobra.Command {
	var job, since, typ string
	var follow, asJSON bool
	cmd := &cobra.Command{
		Use:   "events [--job J] [--since T] [--type PATTERN] [--follow] [--json]",
		Short: "Show the cluster's event stream (nodes, checkpoints, replicas, restarts, migrations, health)",
		Long: `Show the events the coordinator keeps (the newest 10000, across restarts of
the coordinator): nodes joining, dying and draining, health warnings, every
phase of checkpoint rounds with durations and sizes, replica copies and
repairs, restarts, and the phases of migrations. With --follow, new events
are shown as they happen; a subscriber that comes late with --since sees
what it missed first, then the live events, without gaps. The coordinator
cuts off a follower that leaves events unread for 30 s (suspended, or
writing to a stalled pipe); 'cairn events --follow' then takes the stream
up again after the last event it showed.

--since takes an event number (events after it), a duration (events of
the last 10m) or an RFC 3339 time. --type takes a type
(checkpoint.committed), a family (checkpoint.*) or *.`,
		Example: `  cairn events --job sim
  cairn events --follow --type 'migration.*'
  cairn events --since 120 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			q := rpc.EventsQuery{Job: job, Type: typ, Follow: follow}
			if err := q.SetSince(since, time.Now()); since != "" && err != nil {
				return usageError{fmt.Errorf("--since %w", err)}
			}
			return withCoord(func(c *rpc.CoordClient) error {
				out := cmd.OutOrStdout()
				return c.EachEvent(cmd.Context(), q, func(e evv1.Event, line []byte) {
					if asJSON {
						fmt.Fprintln(out, string(line))
					} else {
						fmt.Fprintln(out, table.Event(e))
					}
				})
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&job, "job", "", "only this job's events")
	f.StringVar(&since, "since", "", "only events after this event number, within this duration, or since this time")
	f.StringVar(&typ, "type", "", "only events of this type or family (checkpoint.*)")
	f.BoolVarP(&follow, "follow", "f", false, "keep showing new events as they happen")
	f.BoolVar(&asJSON, "json", false, "one JSON event per line")
	return cmd
}
