package agent

// The rank API's framing and replies.

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	rankv1 "github.com/cairn-hpc/cairn/api/rank/v1"
)

func selfReply(s rankSelf) rankv1.Reply {
	rank := s.Rank
	return rankv1.Reply{OK: true, Job: s.Job, Rank: &rank, Size: s.Size, Mode: s.Mode,
		RestoredFrom: s.RestoredFrom, Incarnation: s.Incarnation, Restored: s.RestoredFrom > 0}
}

func readRequest(r *bufio.Reader) (rankv1.Request, error) {
	var req rankv1.Request
	line, err := rankv1.ReadLine(r)
	if err != nil {
		return req, fmt.Errorf("read a request: %w", err)
	}
	if err := json.Unmarshal(line, &req); err != nil {
		return req, fmt.Errorf("a request is one JSON object on one line: %w", err)
	}
	return req, nil
}

func writeReply(c net.Conn, r rankv1.Reply) {
	b, _ := json.Marshal(r)
	_, _ = c.Write(append(b, '\n'))
}

func rankFail(code, msg string) rankv1.Reply { return rankv1.Reply{Code: code, Error: msg} }

// coordFail maps the coordinator's answer to the rank API's codes.
func coordFail(err error) rankv1.Reply {
	var we *coordv1.Error
	if errors.As(err, &we) {
		switch we.Code {
		case coordv1.CodeAborted:
			return rankFail(rankv1.CodeAborted, err.Error())
		case coordv1.CodeConflict:
			return rankFail(rankv1.CodeConflict, err.Error())
		case coordv1.CodeRateLimited:
			return rankFail(rankv1.CodeRateLimited, err.Error())
		case agentv1.CodeForbidden:
			return rankFail(rankv1.CodeForbidden, err.Error())
		}
		return rankFail(rankv1.CodeUnavailable, err.Error())
	}
	return rankFail(rankv1.CodeUnavailable, err.Error())
}
