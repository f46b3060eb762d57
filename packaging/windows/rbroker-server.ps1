<#
.SYNOPSIS
    Run, set up or register the rbroker coordinator on Windows.

.DESCRIPTION
    rbroker-server.ps1                      serve in this window (Ctrl+C stops it)
    rbroker-server.ps1 -Setup -Hostname gpu-hub.example.org [-SelfSigned] [-Port 8787]
                                            write the config, create the database, a group,
                                            and print a viewer token and an enrollment code
    rbroker-server.ps1 -InstallTask         (as Administrator) start the coordinator at boot
                                            as a scheduled task running as NETWORK SERVICE,
                                            and open the port in Windows Firewall
    rbroker-server.ps1 -UninstallTask       remove that task and firewall rule
    rbroker-server.ps1 -- group list        any other rbroker-server command

    The data dir is $env:RBROKER_SERVER_DATA_DIR, else $env:ProgramData\rbroker-server.
    The coordinator is looked for in .\venv next to this script, else on PATH.
#>
[CmdletBinding()]
param(
    [switch]$Setup,
    [string]$Hostname = $env:COMPUTERNAME,
    [int]$Port = 8787,
    [switch]$SelfSigned,
    [string]$DatabaseUrl = "",
    [switch]$InstallTask,
    [switch]$UninstallTask,
    [Parameter(ValueFromRemainingArguments = $true)][string[]]$Rest
)
$ErrorActionPreference = "Stop"
$TaskName = "rbroker-server"

$DataDir = $env:RBROKER_SERVER_DATA_DIR
if (-not $DataDir) { $DataDir = Join-Path $env:ProgramData "rbroker-server" }
$env:RBROKER_SERVER_DATA_DIR = $DataDir

$Exe = Join-Path $PSScriptRoot "venv\Scripts\rbroker-server.exe"
if (-not (Test-Path $Exe)) {
    $found = Get-Command rbroker-server -ErrorAction SilentlyContinue
    if (-not $found) { throw "rbroker-server not found: pip install the rbroker wheel (dist\rbroker-<version>-py3-none-any.whl[server], built with uv build in a clone) into .\venv next to this script" }
    $Exe = $found.Source
}

if ($Setup) {
    $argv = @("setup", "--non-interactive", "--data-dir", $DataDir, "--public-hostname", $Hostname,
              "--port", "$Port")
    if ($SelfSigned) { $argv += "--self-signed" }
    if ($DatabaseUrl) { $argv += @("--database-url", $DatabaseUrl) }
    & $Exe @argv
    exit $LASTEXITCODE
}

if ($InstallTask) {
    New-Item -ItemType Directory -Force -Path $DataDir | Out-Null
    # Only Administrators, SYSTEM and the service account may read the data dir (keys, tokens).
    icacls $DataDir /inheritance:r /grant:r "Administrators:(OI)(CI)F" "SYSTEM:(OI)(CI)F" `
        "NETWORK SERVICE:(OI)(CI)M" | Out-Null
    $action = New-ScheduledTaskAction -Execute $Exe -Argument "serve --data-dir `"$DataDir`""
    $trigger = New-ScheduledTaskTrigger -AtStartup
    $principal = New-ScheduledTaskPrincipal -UserId "NT AUTHORITY\NETWORK SERVICE" -LogonType ServiceAccount
    $settings = New-ScheduledTaskSettingsSet -RestartCount 999 -RestartInterval (New-TimeSpan -Minutes 1) `
        -ExecutionTimeLimit ([TimeSpan]::Zero) -StartWhenAvailable
    Register-ScheduledTask -TaskName $TaskName -Action $action -Trigger $trigger -Principal $principal `
        -Settings $settings -Force | Out-Null
    New-NetFirewallRule -DisplayName $TaskName -Direction Inbound -Protocol TCP -LocalPort $Port `
        -Action Allow -ErrorAction SilentlyContinue | Out-Null
    Start-ScheduledTask -TaskName $TaskName
    Write-Host "rbroker-server registered as scheduled task '$TaskName' (data dir $DataDir)"
    exit 0
}

if ($UninstallTask) {
    Unregister-ScheduledTask -TaskName $TaskName -Confirm:$false -ErrorAction SilentlyContinue
    Remove-NetFirewallRule -DisplayName $TaskName -ErrorAction SilentlyContinue
    Write-Host "rbroker-server task removed (data dir $DataDir kept)"
    exit 0
}

if ($Rest) {
    & $Exe @Rest
} else {
    & $Exe serve --data-dir $DataDir
}
exit $LASTEXITCODE
