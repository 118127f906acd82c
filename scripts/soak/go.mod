module example.invalid/raftlock/scripts/soak

go 1.19

require example.invalid/raftlock/client/go/raftlock v0.0.0

replace example.invalid/raftlock/client/go/raftlock => ../../client/go
