// What a client does with a whole job, through the coordinator and the
// agents of its ranks' nodes.

package rpc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
)

// RankAgents are the agents of a job's ranks, where the coordinator
// placed them.
type RankAgents struct {
	c         *CoordClient
	job       string
	placement []string          // node of each rank
	addrs     map[string]string // node -> agent address
}

// RankAgents asks the coordinator where a job's ranks are and how their
// nodes' agents are reached.
func (c *CoordClient) RankAgents(ctx context.Context, job string) (*RankAgents, error) {
	st, err := c.Status(ctx, job)
	if err != nil {
		return nil, err
	}
	nodes, err := c.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	ra := &RankAgents{c: c, job: job, placement: st.Placement, addrs: map[string]string{}}
	for _, n := range nodes {
		ra.addrs[n.Name] = n.Addr
	}
	return ra, nil
}

// RankName is rank r's container name on its node.
func (ra *RankAgents) RankName(r int) string { return agentv1.RankName(ra.job, r) }

// Ranks is the job's number of ranks.
func (ra *RankAgents) Ranks() int { return len(ra.placement) }

// Agent returns a client of the agent of rank r's node, with the
// coordinator client's credentials.
func (ra *RankAgents) Agent(r int) *AgentClient {
	node := ra.placement[r]
	return NewAgentClient(ra.addrs[node], node, ra.c.creds)
}

// Logs writes every rank's output, as q asks (its current incarnation's),
// to w, each line after its rank's label "RANK: " (as srun --label does):
// rank after rank, or with q.Follow every rank's lines as they come until
// every rank has stopped. A rank whose output cannot be had does not keep
// the others': its error is joined to the others'.
func (ra *RankAgents) Logs(ctx context.Context, w io.Writer, q agentv1.LogQuery) error {
	out := &labelled{w: w}
	q.Incarnation = 0
	follow := q.Follow
	copyRank := func(r int) error {
		ac := ra.Agent(r)
		defer ac.Close()
		body, err := ac.Log(ctx, ra.RankName(r), q)
		if err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
		defer body.Close()
		if err := out.copy(r, body); err != nil && ctx.Err() == nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
		return nil
	}
	errs := make([]error, len(ra.placement))
	if !follow {
		for r := range ra.placement {
			errs[r] = copyRank(r)
		}
		return errors.Join(errs...)
	}
	var wg sync.WaitGroup
	for r := range ra.placement {
		wg.Go(func() { errs[r] = copyRank(r) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Log writes the output of rank r to w as q asks; with q.Follow, until
// the rank stops or ctx is done (which is not an error).
func (ra *RankAgents) Log(ctx context.Context, w io.Writer, r int, q agentv1.LogQuery) error {
	ac := ra.Agent(r)
	defer ac.Close()
	body, err := ac.Log(ctx, ra.RankName(r), q)
	if err != nil {
		return err
	}
	defer body.Close()
	_, err = io.Copy(w, body)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// Incarnations lists rank r's incarnations whose output its node keeps.
func (ra *RankAgents) Incarnations(ctx context.Context, r int) ([]agentv1.Incarnation, error) {
	ac := ra.Agent(r)
	defer ac.Close()
	return ac.Incarnations(ctx, ra.RankName(r))
}

// labelled writes whole lines of several ranks to w, each after its
// rank's label, one line at a time.
type labelled struct {
	mu sync.Mutex
	w  io.Writer
}

// copy writes r's lines labelled with rank; a last line without its
// newline gets one, so that the next label starts a line.
func (l *labelled) copy(rank int, r io.Reader) error {
	br := bufio.NewReaderSize(r, 64<<10)
	label := []byte(strconv.Itoa(rank) + ": ")
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			if line[len(line)-1] != '\n' {
				line = append(line, '\n')
			}
			l.mu.Lock()
			_, werr := l.w.Write(append(label[:len(label):len(label)], line...))
			l.mu.Unlock()
			if werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// WaitJob polls the job's status every interval until every rank has
// exited, and returns that status.
func (c *CoordClient) WaitJob(ctx context.Context, name string, every time.Duration) (coordv1.JobStatus, error) {
	for {
		st, err := c.Status(ctx, name)
		if err != nil || st.Exited {
			return st, err
		}
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-time.After(every):
		}
	}
}
