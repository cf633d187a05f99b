package hook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
)

// drainBody is how much of a response beyond what is kept is read, so that
// the connection can be used again; a larger body costs a new connection.
const drainBody = 64 << 10

// post sends payload to the URL once and reads the answer from the response's
// status.
func (h *Handler) post(ctx context.Context, outOfTime error, run *Run, payload []byte) outcome {
	event := run.Event
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(payload))
	if err != nil {
		return outcome{result: resultError, err: fmt.Errorf("%s hook: %w", event, err)}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "plugd-hook")
	resp, err := h.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return stopped(ctx, event, outOfTime, false, "")
		}
		// The plugin is told this error; a url.Error's message repeats the
		// URL, which may carry a token.
		if uerr := (*url.Error)(nil); errors.As(err, &uerr) {
			err = uerr.Err
		}
		return outcome{result: resultError, err: fmt.Errorf("%s hook failed: %w", event, err)}
	}
	defer resp.Body.Close()
	// The status is the answer; the body only says why, so an error reading
	// it (even running out of time) changes nothing.
	body, _ := io.ReadAll(io.LimitReader(resp.Body, keepOutput))
	io.Copy(io.Discard, io.LimitReader(resp.Body, drainBody))

	run.HTTPStatus = resp.StatusCode
	run.Output = firstBytes(printable(string(body)), keepOutput)
	reason := firstBytes(run.Output, maxReason)
	switch resp.StatusCode / 100 {
	case 2:
		return outcome{result: resultAccepted}
	case 4:
		return outcome{
			result: resultRefused,
			final:  true,
			err:    withOutput(fmt.Sprintf("%s hook refused the plugin (HTTP %s)", event, resp.Status), reason),
		}
	default:
		return outcome{result: resultError, err: withOutput(fmt.Sprintf("%s hook failed (HTTP %s)", event, resp.Status), reason)}
	}
}
