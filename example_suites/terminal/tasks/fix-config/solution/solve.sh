#!/bin/bash
sed -i -e "s/^port=.*/port=8080/" -e "s/^logging=.*/logging=on/" service.conf
