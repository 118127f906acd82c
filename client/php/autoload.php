<?php

// Registers the Raftlock\ classes (without Composer): require this file.
// The Symfony stores also need Symfony's Lock and Semaphore components
// (Debian: php-symfony-lock, php-symfony-semaphore, whose own autoload.php
// files this loads when they are installed and not loaded yet).

declare(strict_types=1);

spl_autoload_register(static function (string $class): void {
    if (0 !== strncmp($class, 'Raftlock\\', 9)) {
        return;
    }
    $file = __DIR__.'/src/'.str_replace('\\', '/', substr($class, 9)).'.php';
    if (is_file($file)) {
        require $file;
    }
});

foreach (['Lock', 'Semaphore'] as $component) {
    $debian = "/usr/share/php/Symfony/Component/$component/autoload.php";
    if (!interface_exists("Symfony\\Component\\$component\\PersistingStoreInterface") && is_file($debian)) {
        require_once $debian;
    }
}
