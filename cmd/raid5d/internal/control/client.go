package control

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"
)

// Do sends one request to the daemon at the socket path and returns its status after the
// request. Errors: ErrNoDaemon when nothing answers at path; a *RemoteError (matching one of the
// sentinels) when the daemon refused the request; others for a broken exchange.
func Do(path string, req Request) (*Status, error) {
	c, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOTSOCK) {
			return nil, fmt.Errorf("%w: %s: %v", ErrNoDaemon, path, errors.Unwrap(err))
		}
		return nil, err
	}
	defer c.Close()
	timeout := 2 * ioTimeout
	if req.Op == OpAdd || req.Op == OpReplace || req.Op == OpReAdd {
		timeout += ManageWait // the daemon may wait for a remote member to answer
	}
	c.SetDeadline(time.Now().Add(timeout))
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	if _, err := c.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("control: sending %s to %s: %w", req.Op, path, err)
	}
	line, err := bufio.NewReader(io.LimitReader(c, 16<<20)).ReadBytes('\n')
	if err != nil && !(errors.Is(err, io.EOF) && len(line) > 0) {
		return nil, fmt.Errorf("control: reading the answer to %s from %s: %w", req.Op, path, err)
	}
	var resp Response
	if err := json.Unmarshal(line, &resp); err != nil {
		return nil, fmt.Errorf("control: answer from %s: %w", path, err)
	}
	if resp.Error != nil {
		return nil, &RemoteError{Code: resp.Error.Code, Message: resp.Error.Message}
	}
	if resp.Status == nil {
		return nil, fmt.Errorf("control: answer from %s has neither status nor error", path)
	}
	return resp.Status, nil
}
