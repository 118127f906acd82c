<?php

// A worker process for the PHP suite: php worker.php MODE ENDPOINTS ARG...
// Prints one line per event; waits for a line on stdin where the test
// decides when it goes on.

declare(strict_types=1);

require __DIR__.'/../autoload.php';
require_once __DIR__.'/../examples/LockManagerService.php';

use Raftlock\Client;
use Raftlock\Examples\LockManagerService;
use Raftlock\Examples\UnacquiredLockException;
use Raftlock\Symfony\RaftlockStore;
use Symfony\Component\Lock\Key;
use Symfony\Component\Lock\Lock;
use Symfony\Component\Lock\LockFactory;

[, $mode, $endpoints] = $argv;
$out = static function (string $line): void {
    fwrite(\STDOUT, $line."\n");
    fflush(\STDOUT);
};

switch ($mode) {
    case 'lock-wait':
    case 'read':
        $key = new Key($argv[3]);
        $lock = (new LockFactory(new RaftlockStore($endpoints)))->createLockFromKey($key);
        $out('WAITING');
        'read' === $mode ? $lock->acquireRead(true) : $lock->acquire(true);
        $out(('read' === $mode ? 'READING' : 'ACQUIRED').' fence '.RaftlockStore::fence($key));
        fgets(\STDIN);
        $lock->release();
        $out('RELEASED');
        break;
    case 'promote':
        // Reads, then (on a line) promotes to a write lock, blocking.
        $key = new Key($argv[3]);
        $lock = (new LockFactory(new RaftlockStore($endpoints)))->createLockFromKey($key);
        $lock->acquireRead(true);
        $out('READING fence '.RaftlockStore::fence($key));
        fgets(\STDIN);
        $out('PROMOTING');
        $lock->acquire(true);
        $out('PROMOTED fence '.RaftlockStore::fence($key));
        fgets(\STDIN);
        $lock->release();
        $out('RELEASED');
        break;
    case 'handoff':
        // The Symfony docs' cross-process example: a Key serialized by
        // another process, continued here.
        $key = unserialize(base64_decode($argv[3]), ['allowed_classes' => [Key::class]]);
        $lock = new Lock($key, new RaftlockStore($endpoints), 300, false);
        $out('ACQUIRED '.var_export($lock->isAcquired(), true));
        $lock->refresh(60);
        $out(sprintf('REFRESHED %.0f', $lock->getRemainingLifetime()));
        $lock->release();
        $out('RELEASED '.var_export($lock->isAcquired(), true));
        break;
    case 'service':
        $service = new LockManagerService(new Client($endpoints), (int) $argv[4]);
        try {
            $service->lock($argv[3], static function (int $fence) use ($out): void {
                $out("LOCKED fence $fence");
                fgets(\STDIN);
            }, 30);
            $out('DONE');
        } catch (UnacquiredLockException $e) {
            $out('UNACQUIRED '.$e->getMessage());
        }
        break;
    default:
        fwrite(\STDERR, "unknown mode $mode\n");
        exit(2);
}
