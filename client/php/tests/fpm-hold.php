<?php

// A PHP-FPM request (tests/run.php's test_php_fpm_worker_killed_frees_its_lock):
// takes the name in the query string at the client's defaults, says so
// with the worker's process id, and holds it for a minute. The test
// SIGKILLs the worker meanwhile.

declare(strict_types=1);

require __DIR__.'/../autoload.php';

while (ob_get_level() > 0) {
    ob_end_flush();
}
$client = new Raftlock\Client((string) $_SERVER['RAFTLOCK_ENDPOINTS']);
$r = $client->lock((string) $_GET['name'], 30000, 0);
echo $r['acquired'] ? 'HELD pid '.getmypid()."\n" : "NOT ACQUIRED\n";
flush();
// The open keep-alive stream carries the session while the request
// runs (the ttl is 30 s, the test kills the worker within seconds).
sleep(60);
