<?php

declare(strict_types=1);

namespace Raftlock;

/**
 * A request a raftlock node refused, or one no node answered.
 *
 * getStatus() is the gRPC status code's name the node answered
 * ("INVALID_ARGUMENT", "FAILED_PRECONDITION", "PERMISSION_DENIED", ...),
 * getHttpStatus() the HTTP status it came with. A request that found no
 * leader within the client's retry timeout has status "UNAVAILABLE" and
 * HTTP status 0, and its message names each node tried and its last error.
 */
final class RaftlockException extends \RuntimeException
{
    private string $status;
    private int $httpStatus;
    private bool $unreachable;

    public function __construct(string $status, string $message, int $httpStatus = 0, ?\Throwable $previous = null, bool $unreachable = false)
    {
        parent::__construct("raftlock: $status: $message", 0, $previous);
        $this->status = $status;
        $this->httpStatus = $httpStatus;
        $this->unreachable = $unreachable;
    }

    /**
     * True only for the client's UNAVAILABLE when no node could be asked:
     * every endpoint refused the connection or did not resolve, round after
     * round, so nothing was sent. A node's own UNAVAILABLE answer (no
     * leader) is false.
     */
    public function isUnreachable(): bool
    {
        return $this->unreachable;
    }

    public function getStatus(): string
    {
        return $this->status;
    }

    public function getHttpStatus(): int
    {
        return $this->httpStatus;
    }
}
