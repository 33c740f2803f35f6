package shared

import (
	"context"
	"strings"
	"testing"
)

// shortMinter answers every batch with one result fewer than asked.
type shortMinter struct{ Host }

func (shortMinter) MintCredentials(_ context.Context, req *MintCredentialsRequest) (*MintCredentialsResponse, error) {
	return &MintCredentialsResponse{Items: make([]MintCredentialResult, len(req.Items)-1)}, nil
}

// TestMintCredentialsCountsTheAnswer: a BatchMinter that answers another
// count than it was asked is an error of MintCredentials, so that a
// caller may index the results by its items.
func TestMintCredentialsCountsTheAnswer(t *testing.T) {
	req := &MintCredentialsRequest{Items: []*MintCredentialRequest{{Worker: "a"}, {Worker: "b"}}}
	r, err := MintCredentials(context.Background(), shortMinter{}, req)
	if err == nil || !strings.Contains(err.Error(), "asked for 2 credentials, the host answered 1") {
		t.Fatalf("MintCredentials = %+v, %v; want an error naming both counts", r, err)
	}
}
